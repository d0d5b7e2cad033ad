"""The speculative decoding engine: propose -> verify -> accept -> commit over a batch of requests."""
