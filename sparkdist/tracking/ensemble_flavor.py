"""What ensembles logged to MLflow before the ensemble's flavor moved to
`sparkdist.ensemble.mlflow_flavor` still need from here.

Such a model stores the pyfunc script it was logged with, which imports its artifact's key
from this module; where a newer sparkdist is already imported when the model loads, the
import reaches this module, not the copy of sparkdist stored with the model.
"""

ARTIFACT_KEY = "ensemble"
"""`sparkdist.ensemble.mlflow_flavor.ARTIFACT_KEY`, for models logged before the move."""
