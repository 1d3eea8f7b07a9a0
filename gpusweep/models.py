# gpusweep core has no models of its own; the module exists so post_migrate reaches this app.
