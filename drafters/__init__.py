"""Draft proposers (draft model, n-gram, MTP, EAGLE-3) behind one base class and a registry.

They arrive with the speculative engine; the runtime they feed (models scoring token trees on the KVBuffer cache,
commit of accepted paths) is in specdec/.
"""
