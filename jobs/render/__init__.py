"""Where the CreateTrainingJob request is built: the request itself, its image, the container's entry, and what may reach the toolkit's command line."""
