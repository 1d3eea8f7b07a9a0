"""The executors app has no models; back ends are configured per cluster (connection["executor"])."""
