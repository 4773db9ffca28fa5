"""Planning through the identified model: wheel-command optimisation through the engine (`control`; its trials,
loss weights and results in `task`, its L-BFGS in `lbfgs`)."""
