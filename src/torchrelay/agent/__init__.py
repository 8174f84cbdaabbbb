"""The node agent: starts workers and spares, streams their output, reaps them, fences them."""
