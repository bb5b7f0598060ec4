"""The pyfunc model of a logged partition ensemble, as an MLflow "model from code" file.

Why a file: MLflow 3 recommends logging a `PythonModel` as the path of the script that
defines it (`mlflow.models.set_model`) rather than as a cloudpickled object, which it
warns about; the script is stored with the model and run on load. `predict` carries
a type hint, so MLflow does not ask for one (the signature comes from the example).
"""

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel

from sparkdist.ensemble.mlflow_flavor import ARTIFACT_KEY


class PartitionEnsemblePyfunc(PythonModel):
    """Loads the saved ensemble once; predicts classes or values for a DataFrame."""

    def load_context(self, context) -> None:
        from sparkdist.ensemble import PartitionEnsembleModel

        self.model = PartitionEnsembleModel.load(context.artifacts[ARTIFACT_KEY])

    def predict(self, context, model_input: pd.DataFrame, params=None):
        return self.model.predict(model_input)


mlflow.models.set_model(PartitionEnsemblePyfunc())
