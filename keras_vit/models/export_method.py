"""`model.export(...)` of every keras_vit model: Keras' spelling, keras_vit's deployment exports."""


class DeploymentExport:
    """Mixin of every keras_vit model class (listed before `keras.Model`): Keras' `Model.export`
    goes through `keras_vit.export.export_model` for "tf_saved_model", "onnx" and "litert", so a
    model built on any backend exports the same artefacts (TensorFlow writes them), with that
    function's options (`int8`, `image_size`, `with_preprocessing`) and checks; other formats
    ("openvino") go to Keras.

    Example:
        >>> model = keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.25,
        ...     depth_multiplier=0.1, classes=3)  # doctest: +SKIP
        >>> model.export("tiny.onnx", format="onnx")  # doctest: +SKIP
        'tiny.onnx'
    """

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        from keras_vit import export as exports

        if str(format).lower() not in exports.FORMATS:
            return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)
        if input_signature is not None:
            raise exports.ExportError(
                "keras_vit models export with their own input signature (any batch size, the model's image size; "
                "uint8 images of any size with with_preprocessing=True). Use image_size=... to change the size."
            )
        return exports.export_model(self, filepath, format, verbose=bool(verbose), **kwargs)
