"""The sampling stage: logits → the next token id (`sampling`: llama.cpp's chain in numpy), the
token mask of a structured reply (`grammar`, llguidance), drafts from the prompt (`lookup`) and
token log-probabilities in OpenAI's layout (`logprobs`)."""
