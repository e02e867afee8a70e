"""Cards of cross_entropy and the LM head: their cases, inputs and runners (registered with _cards).

NOT BUILT YET: no cases are registered until the ops exist.
"""
