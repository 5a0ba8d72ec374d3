"""OpenAI's fine-tuning API served by Practicum: `files` and `fine_tuning.jobs`, mapped onto
training sets and training jobs (`services.py`), answered in OpenAI's shapes (`apis.py`)."""
