"""The learn-from-comments experiment's parts; `scripts/learn_from_comments.py` is its command
line. `options` holds a run's settings, `comment_set` turns the simulated lead's comments
into a words-only training set, `judge` serves the judge arm's judge, `arms` trains each
arm, `runs` plays a run and prints its tables, and `probe` measures the comment as a hint
before any training."""
