"""Planning through the identified model: wheel-command optimisation through the engine (`control`)."""
