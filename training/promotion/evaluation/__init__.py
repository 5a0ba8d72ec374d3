"""Evaluating a candidate version against the live one: generation and figures."""
