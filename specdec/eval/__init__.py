"""`specdec eval`: prompt sets, the evaluation run, its summary and plots."""
