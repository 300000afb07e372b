"""Real models for tempa's tests and benchmarks: the zoo (`zoo.make(name)`), the hand-written
GPT (`gpt`), and comparison helpers (`compare`). See zoo.py for the case names and lists."""
