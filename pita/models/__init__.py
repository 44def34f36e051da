"""Models: families (reference + guidance + reward models), the tiny local family, the LM wrapper."""
