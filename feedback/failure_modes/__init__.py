"""Failure modes over batches of traces: cheap detectors (`detectors`), and clusters of
what people and the judge wrote about failures (`clustering`, `naming`)."""
