"""Pipeline schedules defined once, as task graphs."""
