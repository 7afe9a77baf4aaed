"""The second pass: the kept records read again and written as shards; the rejection ledger beside them."""
