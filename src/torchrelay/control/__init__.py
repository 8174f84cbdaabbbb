"""The controller: membership, generations, recovery planning, the ledger, the control RPC."""
