"""Training the shipped models: the corpus, the tokenizer, the language models and their drafters."""
