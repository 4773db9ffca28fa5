"""The application layer: configuration (`config`), the fit pipeline (`pipeline`), cross-validation
(`cv`), findings and the HTML reports (`report`, `cv_report`, `plan_report`)."""
