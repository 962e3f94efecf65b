"""The paper's training augmentation settings, as plain numbers (no TensorFlow), so that the
pipeline's signature (`keras_vit.data.pipeline`) and the TensorFlow crop that uses them
(`keras_vit.data.preprocessing`) read them from one place.

    >>> INCEPTION_AREA_RANGE, INCEPTION_ASPECT_RANGE
    ((0.05, 1.0), (0.75, 1.3333333333333333))
"""

#: The paper's / original repo's Inception crop ranges: area fraction and aspect ratio (w / h).
INCEPTION_AREA_RANGE = (0.05, 1.0)
INCEPTION_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
