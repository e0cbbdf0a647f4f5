"""Where a job request is validated: its schema, field rules, cross-field rules, the platform's rules, CreateTrainingJob's limits, the state-size guard, and the reference generated from them."""
