"""The Iceberg mirror target: net changes applied as one commit of new rows and position deletes or DVs."""
