"""The CPU learning demo: a tiny search agent learns multi-hop search on the embedded world with async RL."""
