"""The speculative decoding engine: the step loop (engine.py) over requests (request.py) that a continuous-batching
scheduler (scheduler.py) admits and retires."""
