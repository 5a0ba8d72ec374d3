"""The LLM judge: turns what people wrote about a turn into a rubric, a reward and a
corrected response, and scores groups of candidate responses under a rubric.

`client` owns every call to a judge endpoint; `prompts` holds the versioned prompts;
`schemas` the structured-output schemas and their validation; `agreement` the pure
statistics that say how far the judge can be trusted.
"""
