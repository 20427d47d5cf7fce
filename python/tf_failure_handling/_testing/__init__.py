"""The parts of ``tf_failure_handling.testing``, which re-exports their public names:
``tf_cluster`` (TensorFlow's coordination service and cluster resolver, in memory) and
``checkpoints`` (a checkpoint and its manager, as JSON files). Neither imports the
other, nor TensorFlow; the simulated cluster that runs workers on them is ``testing``'s
own.
"""
