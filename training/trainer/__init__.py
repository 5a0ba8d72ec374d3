"""The training core: pure tensor maths (`loss`), sampling and per-token log-probs
(`sampling`), the job configs (`config`), and the GRPO, SFT and self-distillation loops.

Nothing here imports Django, so the same code runs in a Celery worker, in a script on a
bare GPU machine (`scripts/gpu_check.sh`) and in benchmarks. torch is imported by the
modules themselves: the web process never imports this package.
"""
