"""labtools: the small library behind the LLM Training Lab lessons (mechanisms, no lesson logic)."""
