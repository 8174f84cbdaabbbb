"""Turn a job's ledger into a summary (text or JSON)."""
