"""Identification: parameters with bounds (`params`), residuals and optimisers (`identify`), accuracy
metrics (`metrics`) and the fan-out of batches over Ray (`fanout`). Depends on simulators, never on the
application layer."""
