"""From what a client sends to a ``Request``: the prompt types, the chat template, the tokenizer
protocol, and the input processor that checks and tokenizes."""
