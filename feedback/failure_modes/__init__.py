"""Failure modes over batches of traces, in one package: cheap detectors (`detectors`),
clusters of what people and the judge wrote about failures (`clustering`, `naming`), the
runs that find them and what a cluster becomes (`services`, `selectors`), and their page and
API (`views`, `apis`). The models are feedback's (`feedback/models/`); a failure mode's
evaluation slice is training's (`training/services/evaluation_slices.py`)."""
