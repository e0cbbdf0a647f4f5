"""One module per trainctl command (or pair of commands); cli.main wires them into the app."""
