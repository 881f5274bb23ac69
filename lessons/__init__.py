"""One module per lesson: the experiments a notebook runs and plots."""
