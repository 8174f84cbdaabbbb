"""State transfer: flatten registered state to (schema, tensors) and stream it between ranks."""
