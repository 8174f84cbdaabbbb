"""Worker scripts, one per system; each is launched as a file by its system's launcher."""
