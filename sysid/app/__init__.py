"""The application layer: configuration (`config`), the fit pipeline as named phases (`pipeline`),
the typed results document it produces (`results`), cross-validation (`cv`), findings and the HTML
reports (`report`, `cv_report`, `plan_report`). The command line over it is `sysid.cli`."""
