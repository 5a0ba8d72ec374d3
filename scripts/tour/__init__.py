"""The tour measurement's parts; `scripts/tour_demo.py` is its command line. `summary` holds
what a run measured and the summary over seeds (all that `--summary-from` needs), `jobs`
the SFT and GRPO configs a seed's training set is trained with."""
