"""The in-process runtime: the public API, the stable process group, step commit and recovery."""
