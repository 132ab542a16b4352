// Placeholder: tests come with the implementation.
