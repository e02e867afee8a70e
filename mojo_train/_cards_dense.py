"""Cards of linear, RMSNorm, ReLU: their cases, inputs and runners (registered with _cards).

NOT BUILT YET: no cases are registered until the ops exist.
"""
