// Placeholder: implemented in the agent split (issue 9).
