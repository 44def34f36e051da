"""The executor's rooms: each concern of :class:`pita.core.executor.Executor` beside its loop."""
