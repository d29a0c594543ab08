"""Every registered operator has a value test and a gradient check, or a stated and checked reason why not.

The operators come from the registry at run time (``_core.list_ops``), so a new operator fails here
until it has a row in a table of test_operator_table.py or test_gradients.py, a dedicated test named
below, or an exemption. An alias is covered with the operator it names. Nothing here is taken on
trust: a named test must exist and mention its operator, a gradient node must appear in the
gradient of the forward operator named for it, an operator said to have no gradient must refuse
backward naming itself, and one said to take no arrays must build a symbol without arguments.
"""

import ast
import functools
import inspect
import pathlib
import re

import numpy as np
import pytest

import oxnet as mx
from oxnet import _core, autograd
from oxnet.ndarray.register import SUBNAMESPACES

import test_gradients as gradients
import test_nn_ops as nn_ops
import test_operator_table as table

HERE = pathlib.Path(__file__).resolve().parent
nd = mx.nd

REGISTRY = {name: list(aliases) for name, aliases, *_ in _core.list_ops()}
CANONICAL = {spelling: name for name, aliases in REGISTRY.items() for spelling in [name, *aliases]}

# ---- what the tables cover ---------------------------------------------------------------------

# Table rows named for no single operator: key -> why.
ROWS_NAMING_NO_OPERATOR = {
    "getitem": "test_gradients.SHAPE_CASES: NDArray.__getitem__, which picks its operators (slice, Reshape) itself",
}


def _row_operator(key, prefix=""):
    """The operator a row keyed ``<op>`` or ``<op>_<variant>`` tests: the longest operator name (or
    alias, with a leading underscore or ``prefix`` dropped) that the key is or starts with."""
    matches = {}
    for spelling, name in CANONICAL.items():
        forms = {spelling, spelling[1:] if spelling.startswith("_") else spelling,
                 spelling[len(prefix):] if prefix and spelling.startswith(prefix) else spelling}
        for form in forms:
            if key == form or key.startswith(form + "_"):
                matches.setdefault(len(form), set()).add(name)
    if not matches:
        return None
    best = matches[max(matches)]
    assert len(best) == 1, "row %r names several operators: %s" % (key, sorted(best))
    return best.pop()


def _table_rows(tables):
    """{operator: [table, ...]} for ``tables`` [(table name, keys, how keys name operators)], and the
    rows that name no registered operator. ``how`` is a function of the key giving an operator
    name, or the string "variant" (or "variant:<prefix>") for keys resolved by ``_row_operator``."""
    covered, unknown = {}, []
    for where, keys, how in tables:
        for key in keys:
            if isinstance(how, str):
                name = _row_operator(key, how.partition(":")[2])
                if name is None and key in ROWS_NAMING_NO_OPERATOR:
                    continue
            else:
                name = CANONICAL.get(how(key))
            if name is None:
                unknown.append("%s[%r]" % (where, key))
            else:
                covered.setdefault(name, []).append(where)
    return covered, unknown


def _same(key):
    return key


VALUE_TABLES = [
    ("test_operator_table.UNARY", table.UNARY, _same),
    ("test_operator_table.BINARY", table.BINARY, lambda k: "broadcast_" + k),
    ("test_operator_table.ELEMWISE_NAME", table.ELEMWISE_NAME.values(), _same),
    ("test_operator_table.SCALAR", table.SCALAR, _same),
    ("test_operator_table.REDUCE", table.REDUCE, _same),
    ("test_operator_table.REARRANGE", [row[0] for row in table.REARRANGE], _same),
    ("test_operator_table.SAMPLERS", [row[0] for row in table.SAMPLERS], lambda k: "_random_" + k),
    ("test_operator_table.LINALG", table.LINALG, "variant:_linalg_"),
    ("test_nn_ops.MP_UPDATES", nn_ops.MP_UPDATES, _same),
    ("test_nn_ops.PRELOADED_UPDATES", nn_ops.PRELOADED_UPDATES, _same),
]
GRADIENT_TABLES = [
    ("test_gradients.UNARY", gradients.UNARY, _same),
    ("test_gradients.ZERO_GRADIENT", gradients.ZERO_GRADIENT, _same),
    ("test_gradients.ZERO_GRADIENT_COMPARISONS", gradients.ZERO_GRADIENT_COMPARISONS, _same),
    ("test_gradients.ZERO_GRADIENT_SAMPLERS", gradients.ZERO_GRADIENT_SAMPLERS, _same),
    ("test_gradients.BINARY_DOMAINS", gradients.BINARY_DOMAINS, lambda k: "broadcast_" + k),
    ("test_gradients.ELEMWISE", gradients.ELEMWISE, _same),
    ("test_gradients.SCALAR", gradients.SCALAR, _same),
    ("test_gradients.REDUCE", gradients.REDUCE, _same),
    ("test_gradients.SHAPE_CASES", gradients.SHAPE_CASES, "variant"),
    ("test_gradients.LINALG_GRADIENTS", gradients.LINALG_GRADIENTS, "variant:_linalg_"),
    ("test_gradients.IMAGE_CASES", gradients.IMAGE_CASES, "variant"),
    ("test_gradients.PASS_THROUGH_AUGMENTATIONS", gradients.PASS_THROUGH_AUGMENTATIONS, _same),
    ("test_gradients.SECOND_ORDER", gradients.SECOND_ORDER, _same),
]

# ---- dedicated tests: operator -> "file::test", or ("file::test", "the mx function it calls") ---

VALUE_TESTS = {
    "erfinv": "test_operator_table.py::test_erfinv_inverts_erf_and_flags",
    "isnan": "test_operator_table.py::test_erfinv_inverts_erf_and_flags",
    "isinf": "test_operator_table.py::test_erfinv_inverts_erf_and_flags",
    "isfinite": "test_operator_table.py::test_erfinv_inverts_erf_and_flags",
    "BlockGrad": "test_operator_table.py::test_eye_linspace_stop_gradient",
    "_backward_relu": "test_operator_table.py::test_backward_relu",
    "_contrib_allclose": "test_operator_table.py::test_allclose",
    "argmax": "test_operator_table.py::test_argmax_argmin",
    "argmin": "test_operator_table.py::test_argmax_argmin",
    "argmax_channel": "test_operator_table.py::test_argmax_argmin",
    "norm": "test_operator_table.py::test_norm_and_moments",
    "moments": "test_operator_table.py::test_norm_and_moments",
    "dot": "test_operator_table.py::test_dot",
    "batch_dot": "test_operator_table.py::test_batch_dot",
    "shape_array": "test_operator_table.py::test_one_hot_shape_array_reshape_like",
    "size_array": "test_operator_table.py::test_one_hot_shape_array_reshape_like",
    "reshape_like": "test_operator_table.py::test_one_hot_shape_array_reshape_like",
    "one_hot": "test_operator_table.py::test_one_hot_shape_array_reshape_like",
    "_identity_with_attr_like_rhs": "test_operator_table.py::test_slice_assign_and_identity_with_attr_like_rhs",
    "_slice_assign": "test_operator_table.py::test_slice_assign_and_identity_with_attr_like_rhs",
    "_slice_assign_scalar": "test_operator_table.py::test_slice_assign_and_identity_with_attr_like_rhs",
    "transpose": "test_operator_table.py::test_transpose",
    "Reshape": "test_operator_table.py::test_shape_ops",
    "Flatten": "test_operator_table.py::test_shape_ops",
    "expand_dims": "test_operator_table.py::test_shape_ops",
    "slice": "test_operator_table.py::test_shape_ops",
    "slice_axis": "test_operator_table.py::test_shape_ops",
    "take": "test_operator_table.py::test_shape_ops",
    "Concat": "test_operator_table.py::test_concat_and_split",
    "SliceChannel": "test_operator_table.py::test_concat_and_split",
    "Cast": "test_operator_table.py::test_cast",
    "amp_cast": "test_operator_table.py::test_amp_cast",
    "amp_multicast": "test_operator_table.py::test_amp_multicast",
    "all_finite": "test_operator_table.py::test_all_finite_and_multi_all_finite",
    "multi_all_finite": "test_operator_table.py::test_all_finite_and_multi_all_finite",
    "depth_to_space": "test_operator_table.py::test_depth_to_space_and_back",
    "space_to_depth": "test_operator_table.py::test_depth_to_space_and_back",
    "broadcast_like": "test_operator_table.py::test_stack_and_broadcast_like",
    "stack": "test_operator_table.py::test_stack_and_broadcast_like",
    "clip": "test_operator_table.py::test_clip_where_add_n",
    "where": "test_operator_table.py::test_clip_where_add_n",
    "add_n": "test_operator_table.py::test_clip_where_add_n",
    "sort": "test_operator_table.py::test_sort_argsort_topk",
    "argsort": "test_operator_table.py::test_sort_argsort_topk",
    "topk": "test_operator_table.py::test_sort_argsort_topk",
    "pick": "test_operator_table.py::test_pick_batch_take_gather_scatter",
    "batch_take": "test_operator_table.py::test_pick_batch_take_gather_scatter",
    "gather_nd": "test_operator_table.py::test_pick_batch_take_gather_scatter",
    "scatter_nd": "test_operator_table.py::test_pick_batch_take_gather_scatter",
    "_scatter_set_nd": "test_ndarray.py::test_scatter_set_nd_writes_in_place",
    "slice_like": "test_operator_table.py::test_slice_like_diag_boolean_mask",
    "boolean_mask": "test_operator_table.py::test_slice_like_diag_boolean_mask",
    "diag": "test_operator_table.py::test_slice_like_diag_boolean_mask",
    "pad": "test_operator_table.py::test_pad",
    "zeros_like": "test_operator_table.py::test_creation_ops",
    "ones_like": "test_operator_table.py::test_creation_ops",
    "_zeros": ("test_operator_table.py::test_creation_ops", "nd.zeros"),
    "_ones": ("test_operator_table.py::test_creation_ops", "nd.ones"),
    "_full": ("test_operator_table.py::test_creation_ops", "nd.full"),
    "_arange": ("test_operator_table.py::test_creation_ops", "nd.arange"),
    "_eye": ("test_operator_table.py::test_eye_linspace_stop_gradient", "nd.eye"),
    "_linspace": ("test_operator_table.py::test_eye_linspace_stop_gradient", "nd.linspace"),
    "_random_uniform": ("test_operator_table.py::test_random_uniform_normal_are_seeded_and_distributed",
                        "nd.random.uniform"),
    "_random_normal": ("test_operator_table.py::test_random_uniform_normal_are_seeded_and_distributed",
                       "nd.random.normal"),
    "_sample_uniform": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
                        "nd.random.uniform"),
    "_sample_normal": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
                       "nd.random.normal"),
    "_sample_gamma": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle", "nd.random.gamma"),
    "_sample_exponential": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
                            "nd.random.exponential"),
    "_sample_poisson": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
                        "nd.random.poisson"),
    "_sample_negative_binomial": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
                                  "nd.random.negative_binomial"),
    "_sample_generalized_negative_binomial": (
        "test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
        "nd.random.generalized_negative_binomial"),
    "_sample_multinomial": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle",
                            "nd.random.multinomial"),
    "_shuffle": ("test_operator_table.py::test_array_parameter_samplers_multinomial_shuffle", "nd.random.shuffle"),
    "_image_to_tensor": "test_gluon_vision.py::test_to_tensor_and_normalize_match_numpy",
    "_image_normalize": "test_gluon_vision.py::test_to_tensor_and_normalize_match_numpy",
    "_image_resize": ("test_gluon_vision.py::test_imresize_bilinear_matches_reference", "image.imresize"),
    "_image_crop": "test_gluon_vision.py::test_crop_forward_backward_and_bounds",
    "_image_flip_left_right": "test_gluon_vision.py::test_flips_on_images_and_batches",
    "_image_flip_top_bottom": "test_gluon_vision.py::test_flips_on_images_and_batches",
    "_image_random_flip_left_right": "test_gluon_vision.py::test_flips_on_images_and_batches",
    "_image_random_flip_top_bottom": "test_operator_table.py::test_random_image_augmentations_draw_within_their_ranges",
    "_image_random_color_jitter": "test_operator_table.py::test_random_image_augmentations_draw_within_their_ranges",
    "_image_random_lighting": "test_operator_table.py::test_random_image_augmentations_draw_within_their_ranges",
    "_image_random_brightness": "test_gluon_vision.py::test_color_operators_with_fixed_factors_match_numpy",
    "_image_random_contrast": "test_gluon_vision.py::test_color_operators_with_fixed_factors_match_numpy",
    "_image_random_saturation": "test_gluon_vision.py::test_color_operators_with_fixed_factors_match_numpy",
    "_image_random_hue": "test_gluon_vision.py::test_color_operators_with_fixed_factors_match_numpy",
    "_image_adjust_lighting": "test_gluon_vision.py::test_color_operators_with_fixed_factors_match_numpy",
    "FullyConnected": "test_nn_ops.py::test_fully_connected",
    "Activation": "test_nn_ops.py::test_activation",
    "LeakyReLU": "test_nn_ops.py::test_leaky_relu",
    "softmax": "test_nn_ops.py::test_softmax_family",
    "log_softmax": "test_nn_ops.py::test_softmax_family",
    "softmin": "test_nn_ops.py::test_softmax_family",
    "SoftmaxActivation": "test_nn_ops.py::test_softmax_activation",
    "SoftmaxOutput": "test_nn_ops.py::test_softmax_output",
    "LinearRegressionOutput": "test_nn_ops.py::test_regression_outputs",
    "LogisticRegressionOutput": "test_nn_ops.py::test_regression_outputs",
    "MAERegressionOutput": "test_nn_ops.py::test_regression_outputs",
    "MakeLoss": "test_nn_ops.py::test_make_loss",
    "Dropout": "test_nn_ops.py::test_dropout_training_inference_and_axes",
    "Convolution": "test_nn_ops.py::test_convolution",
    "Deconvolution": "test_nn_ops.py::test_deconvolution",
    "Pooling": "test_nn_ops.py::test_pooling",
    "BatchNorm": "test_nn_ops.py::test_batch_norm_training_and_inference",
    "LayerNorm": "test_nn_ops.py::test_layer_norm",
    "GroupNorm": "test_nn_ops.py::test_group_instance_l2_normalization_match_mxnet",
    "InstanceNorm": "test_nn_ops.py::test_group_instance_l2_normalization_match_mxnet",
    "L2Normalization": "test_nn_ops.py::test_group_instance_l2_normalization_match_mxnet",
    "LRN": "test_nn_ops.py::test_lrn_and_upsampling_match_mxnet",
    "UpSampling": "test_nn_ops.py::test_lrn_and_upsampling_match_mxnet",
    "Embedding": "test_nn_ops.py::test_embedding",
    "smooth_l1": "test_nn_ops.py::test_smooth_l1",
    "softmax_cross_entropy": "test_nn_ops.py::test_softmax_cross_entropy",
    "sgd_update": "test_nn_ops.py::test_sgd_family_updates",
    "sgd_mom_update": "test_nn_ops.py::test_sgd_family_updates",
    "nag_mom_update": "test_nn_ops.py::test_sgd_family_updates",
    "signsgd_update": "test_nn_ops.py::test_sgd_family_updates",
    "signum_update": "test_nn_ops.py::test_sgd_family_updates",
    "adam_update": "test_nn_ops.py::test_adaptive_updates",
    "rmsprop_update": "test_nn_ops.py::test_adaptive_updates",
    "rmspropalex_update": "test_nn_ops.py::test_adaptive_updates",
    "ftrl_update": "test_nn_ops.py::test_adaptive_updates",
    "ftml_update": "test_nn_ops.py::test_ftml_update",
    "mp_sgd_mom_update": "test_nn_ops.py::test_multi_precision_and_multi_weight_updates",
    "multi_sgd_update": "test_nn_ops.py::test_multi_precision_and_multi_weight_updates",
    "multi_sgd_mom_update": "test_nn_ops.py::test_multi_precision_and_multi_weight_updates",
    "_contrib_adamw_update": "test_nn_ops.py::test_adamw_and_lamb_update_ops",
    "multi_adam_update": "test_nn_ops.py::test_multi_adam_updates_step_each_weight_as_its_single_update",
    "_multi_adamw_update": "test_nn_ops.py::test_multi_adam_updates_step_each_weight_as_its_single_update",
    "lamb_update_phase1": "test_nn_ops.py::test_adamw_and_lamb_update_ops",
    "lamb_update_phase2": "test_nn_ops.py::test_adamw_and_lamb_update_ops",
    "mp_lamb_update_phase1": "test_nn_ops.py::test_multi_precision_lamb_phases_step_the_master_as_the_float32_phases",
    "mp_lamb_update_phase2": "test_nn_ops.py::test_multi_precision_lamb_phases_step_the_master_as_the_float32_phases",
    "multi_sum_sq": "test_optimizers.py::test_multi_sum_sq_and_multi_lars_operators",
    "multi_lars": "test_optimizers.py::test_multi_sum_sq_and_multi_lars_operators",
    "RNN": "test_rnn_ops.py::test_rnn_matches_numpy_and_numeric_gradients",
    "SequenceLast": "test_rnn_ops.py::test_sequence_ops_match_mxnet",
    "SequenceMask": "test_rnn_ops.py::test_sequence_ops_match_mxnet",
    "SequenceReverse": "test_rnn_ops.py::test_sequence_ops_match_mxnet",
    "CTCLoss": "test_ctc_loss.py::test_ctc_loss_matches_brute_force",
    "Custom": "test_custom_op.py::test_imperative_values_and_aux_state",
}

GRADIENT_TESTS = {
    "dot": "test_gradients.py::test_dot_gradient",
    "batch_dot": "test_gradients.py::test_dot_gradient",
    "take": "test_gradients.py::test_take_and_where_gradients",
    "where": "test_gradients.py::test_take_and_where_gradients",
    "pick": "test_gradients.py::test_index_driven_op_gradients",
    "gather_nd": "test_gradients.py::test_index_driven_op_gradients",
    "scatter_nd": "test_gradients.py::test_index_driven_op_gradients",
    "boolean_mask": "test_gradients.py::test_index_driven_op_gradients",
    "_backward_tile": "test_gradients.py::test_tile_and_concat_second_order",
    "_backward_softmax": "test_gradients.py::test_softmax_gradients_are_differentiable",
    "_backward_log_softmax": "test_gradients.py::test_softmax_gradients_are_differentiable",
    "_image_to_tensor": "test_gradients.py::test_image_to_tensor_gradient",
    "_sample_multinomial": "test_gradients.py::test_multinomial_log_probability_gradient",
    "FullyConnected": "test_nn_ops.py::test_fully_connected",
    "Activation": "test_nn_ops.py::test_activation",
    "LeakyReLU": "test_nn_ops.py::test_leaky_relu",
    "softmax": "test_nn_ops.py::test_softmax_family",
    "log_softmax": "test_nn_ops.py::test_softmax_family",
    "softmin": "test_nn_ops.py::test_softmax_family",
    "SoftmaxActivation": "test_nn_ops.py::test_softmax_activation",
    "SoftmaxOutput": "test_nn_ops.py::test_softmax_output",
    "LinearRegressionOutput": "test_nn_ops.py::test_regression_outputs",
    "LogisticRegressionOutput": "test_nn_ops.py::test_regression_outputs",
    "MAERegressionOutput": "test_nn_ops.py::test_regression_outputs",
    "MakeLoss": "test_nn_ops.py::test_make_loss",
    "Dropout": "test_nn_ops.py::test_dropout_training_inference_and_axes",
    "Convolution": "test_nn_ops.py::test_convolution",
    "Deconvolution": "test_nn_ops.py::test_deconvolution",
    "Pooling": "test_nn_ops.py::test_pooling",
    "BatchNorm": "test_nn_ops.py::test_batch_norm_training_and_inference",
    "LayerNorm": "test_nn_ops.py::test_layer_norm",
    "GroupNorm": "test_nn_ops.py::test_group_instance_l2_normalization_gradients_and_errors",
    "InstanceNorm": "test_nn_ops.py::test_group_instance_l2_normalization_gradients_and_errors",
    "L2Normalization": "test_nn_ops.py::test_group_instance_l2_normalization_gradients_and_errors",
    "LRN": "test_nn_ops.py::test_lrn_and_upsampling_gradients_and_errors",
    "UpSampling": "test_nn_ops.py::test_lrn_and_upsampling_gradients_and_errors",
    "Embedding": "test_nn_ops.py::test_embedding",
    "smooth_l1": "test_nn_ops.py::test_smooth_l1",
    "softmax_cross_entropy": "test_nn_ops.py::test_softmax_cross_entropy",
    "RNN": "test_rnn_ops.py::test_rnn_matches_numpy_and_numeric_gradients",
    "SequenceLast": "test_rnn_ops.py::test_sequence_ops_without_lengths_and_errors",
    "SequenceMask": "test_rnn_ops.py::test_sequence_ops_without_lengths_and_errors",
    "SequenceReverse": "test_rnn_ops.py::test_sequence_ops_without_lengths_and_errors",
    "CTCLoss": "test_ctc_loss.py::test_ctc_loss_gradient_matches_finite_differences",
    "Custom": "test_custom_op.py::test_autograd_gradient_matches_numpy",
}

# ---- gradient nodes: operators that gradients are made of --------------------------------------
# Their values are what the gradient check of the forward operator compares against finite
# differences. node -> (forward operator, (function of float64 inputs using it, input shapes)).

def _rnn(x, params, h, c):
    return nd.RNN(x, params, h, c, state_size=2, num_layers=1, mode="lstm")


def _index(*values):
    return nd.array(values, dtype="float64")


GRADIENT_NODES = {
    "_reduce_sum_to_like": ("broadcast_mul", gradients.SECOND_ORDER["_reduce_sum_to_like"]),
    "_broadcast_reduced_like": ("sum", gradients.SECOND_ORDER["_broadcast_reduced_like"]),
    "_cast_like": ("Cast", (lambda x: nd.cast(x, dtype="float32"), [(2, 3)])),
    "_digamma": ("gammaln", (lambda x: nd.gammaln(x + 2), [(2, 3)])),
    "_backward_relu": ("relu", (nd.relu, [(2, 3)])),
    "_backward_FullyConnected": ("FullyConnected", gradients.SECOND_ORDER["_backward_FullyConnected"]),
    "_backward_Concat": ("Concat", gradients.SECOND_ORDER["_backward_Concat"]),
    "_backward_slice_axis": ("slice_axis", gradients.SECOND_ORDER["_backward_slice_axis"]),
    "_backward_take": ("take", gradients.SECOND_ORDER["_backward_take"]),
    "_backward_tile": ("tile", (lambda x: nd.tile(x, reps=(2, 1)), [(2, 3)])),
    "_backward_repeat": ("repeat", gradients.SECOND_ORDER["_backward_repeat"]),
    "_backward_order": ("sort", (lambda x: nd.sort(x, axis=1), [(2, 3)])),
    "_backward_pick": ("pick", gradients.SECOND_ORDER["_backward_pick"]),
    "_backward_gather_nd": ("gather_nd", gradients.SECOND_ORDER["_backward_gather_nd"]),
    "_backward_slice_like": ("slice_like", gradients.SECOND_ORDER["_backward_slice_like"]),
    "_backward_boolean_mask": ("boolean_mask", gradients.SECOND_ORDER["_backward_boolean_mask"]),
    "_backward_diag": ("diag", gradients.SECOND_ORDER["_backward_diag"]),
    "_backward_pad": ("pad", gradients.SECOND_ORDER["_backward_pad"]),
    "_backward_image_to_tensor": ("_image_to_tensor", (nd.image.to_tensor, [(4, 4, 3)])),
    "_backward_image_normalize": ("_image_normalize", gradients.SECOND_ORDER["_backward_image_normalize"]),
    "_backward_image_crop": ("_image_crop", (lambda x: nd.image.crop(x, x=1, y=1, width=2, height=2), [(4, 4, 3)])),
    "_backward_LeakyReLU": ("LeakyReLU", (lambda x: nd.LeakyReLU(x, act_type="elu"), [(2, 3)])),
    "_backward_softmax": ("softmax", (nd.softmax, [(2, 3)])),
    "_backward_log_softmax": ("log_softmax", (nd.log_softmax, [(2, 3)])),
    "_backward_Convolution": ("Convolution", (lambda x, w, b: nd.Convolution(x, w, b, kernel=(2, 2), num_filter=1),
                                              [(1, 1, 3, 3), (1, 1, 2, 2), (1,)])),
    "_backward_Deconvolution": ("Deconvolution", (
        lambda x, w: nd.Deconvolution(x, w, kernel=(2, 2), num_filter=1, no_bias=True), [(1, 1, 2, 2), (1, 1, 2, 2)])),
    "_backward_Pooling": ("Pooling", (lambda x: nd.Pooling(x, kernel=(2, 2), pool_type="avg"), [(1, 1, 4, 4)])),
    "_backward_BatchNorm": ("BatchNorm", (
        lambda x, g, b: nd.BatchNorm(x, g, b, nd.zeros(3, dtype="float64"), nd.ones(3, dtype="float64"),
                                     fix_gamma=False), [(2, 3, 2), (3,), (3,)])),
    "_backward_LayerNorm": ("LayerNorm", (nd.LayerNorm, [(2, 3), (3,), (3,)])),
    "_backward_GroupNorm": ("GroupNorm", (lambda x, g, b: nd.GroupNorm(x, g, b, num_groups=2),
                                          [(2, 4, 2), (2,), (2,)])),
    "_backward_L2Normalization": ("L2Normalization", (nd.L2Normalization, [(2, 3)])),
    "_backward_LRN": ("LRN", (lambda x: nd.LRN(x, nsize=3), [(1, 3, 2, 2)])),
    "_backward_RNN": ("RNN", (_rnn, [(2, 1, 2), (48,), (1, 1, 2), (1, 1, 2)])),
    "_backward_SequenceLast": ("SequenceLast", (nd.SequenceLast, [(3, 2, 2)])),
    "_backward_SoftmaxOutput": ("SoftmaxOutput", (lambda x: nd.SoftmaxOutput(x, _index(0, 2)), [(2, 3)])),
    "_backward_RegressionOutput": ("LinearRegressionOutput", (
        lambda x: nd.LinearRegressionOutput(x, nd.zeros((2, 3), dtype="float64")), [(2, 3)])),
    "_backward_MakeLoss": ("MakeLoss", (nd.MakeLoss, [(2, 3)])),
    "_backward_smooth_l1": ("smooth_l1", (lambda x: nd.smooth_l1(x, scalar=1.0), [(2, 3)])),
    "_backward_softmax_cross_entropy": ("softmax_cross_entropy", (
        lambda x: nd.softmax_cross_entropy(x, _index(0, 2)), [(2, 3)])),
    "_backward_ctc_loss": ("CTCLoss", (lambda x: nd.CTCLoss(x, _index([1, 2])), [(4, 1, 3)])),
    "_backward_sample_multinomial": ("_sample_multinomial", (
        lambda p: nd._sample_multinomial(nd.softmax(p), shape=(2,), get_prob=True)[1], [(2, 3)])),
}

# ---- exemptions ---------------------------------------------------------------------------------

SECOND_ORDER_AS_MXNET = ("gradient node with no gradient of its own, as the backward operator of MXNet 1.9.1 "
                         "(second order through its forward operator raises)")
TO_TENSOR_SECOND_ORDER = ("gradient node with no gradient of its own; MXNet 1.9.1 has no such node (its "
                          "to_tensor gradient copies the output gradient)")
DIGAMMA_GRADIENT = ("trigamma (the second derivative of gammaln) is not implemented: MXNet 1.9.1's "
                    "_backward_gammaln has no gradient either")

# Gradient nodes without a gradient: node -> reason. Checked: second order through the node's
# GRADIENT_NODES function raises naming the node.
NO_SECOND_ORDER = {
    "_digamma": DIGAMMA_GRADIENT,
    "_backward_image_to_tensor": TO_TENSOR_SECOND_ORDER,
    **{node: SECOND_ORDER_AS_MXNET for node in [
        "_backward_order", "_backward_image_crop", "_backward_LeakyReLU", "_backward_Convolution",
        "_backward_Deconvolution", "_backward_Pooling", "_backward_BatchNorm", "_backward_LayerNorm",
        "_backward_GroupNorm", "_backward_L2Normalization", "_backward_LRN", "_backward_RNN",
        "_backward_SequenceLast", "_backward_SoftmaxOutput", "_backward_RegressionOutput", "_backward_MakeLoss",
        "_backward_smooth_l1", "_backward_softmax_cross_entropy", "_backward_ctc_loss",
        "_backward_sample_multinomial"]},
}

IN_PLACE_UPDATE = "optimizer update: writes weights and states in place, no gradient (none in MXNet 1.9.1 either)"
OPTIMIZER_STATISTIC = "optimizer helper computing norms or rates from weights: no gradient (none in MXNet 1.9.1)"
RANDOM_PERMUTATION = "random permutation: no gradient (none in MXNet 1.9.1 either)"
INDEX_WRITE = "in-place write of NDArray.__setitem__: no gradient (none in MXNet 1.9.1 either)"
BATCH_TAKE = "deprecated in favour of pick: no gradient (none in MXNet 1.9.1 either)"
CLOSENESS_TEST = "a yes/no comparison of two arrays: no gradient (none in MXNet 1.9.1 either)"
OVERFLOW_CHECK = "AMP's overflow check of gradients: no gradient (none in MXNet 1.9.1 either)"
RESIZE = ("no gradient: MXNet 1.9.1's gradient copies the output gradient, which fits only an unchanged size; "
          "oxnet registers none")

_UPDATE_INPUTS = {
    # update -> (number of array inputs: weight, gradient, states and masters, then parameters)
    "sgd_update": (2, dict(lr=0.1)), "mp_sgd_update": (3, dict(lr=0.1)),
    "sgd_mom_update": (3, dict(lr=0.1)), "mp_sgd_mom_update": (4, dict(lr=0.1)),
    "nag_mom_update": (3, dict(lr=0.1)), "mp_nag_mom_update": (4, dict(lr=0.1)),
    "multi_sgd_update": (2, dict(lrs=(0.1,), wds=(0.0,))), "multi_mp_sgd_update": (3, dict(lrs=(0.1,), wds=(0.0,))),
    "multi_sgd_mom_update": (3, dict(lrs=(0.1,), wds=(0.0,))),
    "multi_mp_sgd_mom_update": (4, dict(lrs=(0.1,), wds=(0.0,))),
    "preloaded_multi_sgd_update": (4, {}), "preloaded_multi_mp_sgd_update": (5, {}),
    "preloaded_multi_sgd_mom_update": (5, {}), "preloaded_multi_mp_sgd_mom_update": (6, {}),
    "adam_update": (4, dict(lr=0.1)), "_contrib_adamw_update": (5, dict(lr=0.1, eta=1.0)),
    "multi_adam_update": (4, dict(lrs=(0.1,), wds=(0.0,))), "multi_mp_adam_update": (5, dict(lrs=(0.1,), wds=(0.0,))),
    "_multi_adamw_update": (5, dict(lrs=(0.1,), wds=(0.0,), etas=(1.0,))),
    "_multi_mp_adamw_update": (6, dict(lrs=(0.1,), wds=(0.0,), etas=(1.0,))),
    "_contrib_mp_adamw_update": (6, dict(lr=0.1, eta=1.0)), "lamb_update_phase1": (4, dict(t=1, wd=0.0)),
    "mp_lamb_update_phase1": (5, dict(t=1, wd=0.0)), "lamb_update_phase2": (4, dict(lr=0.1)),
    "mp_lamb_update_phase2": (5, dict(lr=0.1)), "ftml_update": (5, dict(lr=0.1, t=1)),
    "rmsprop_update": (3, dict(lr=0.1)), "rmspropalex_update": (5, dict(lr=0.1)), "ftrl_update": (4, dict(lr=0.1)),
    "signsgd_update": (2, dict(lr=0.1)), "signum_update": (3, dict(lr=0.1)),
}


def _update_call(op):
    count, params = _UPDATE_INPUTS[op]
    # Multi-precision updates need float32 states and masters; float32 serves every update.
    return lambda *xs: getattr(nd, op)(*[x.astype("float32") for x in xs], **params), [(1,)] * count


# Operators without a gradient: op -> (reason, (function, input shapes) whose backward must raise
# naming the operator).
NOT_DIFFERENTIABLE = {
    **{op: (IN_PLACE_UPDATE, _update_call(op)) for op in _UPDATE_INPUTS},
    "multi_sum_sq": (OPTIMIZER_STATISTIC, (lambda a, b: nd.multi_sum_sq(a, b, num_arrays=2), [(2,), (3,)])),
    "multi_lars": (OPTIMIZER_STATISTIC, (lambda *xs: nd.multi_lars(*[x.astype("float32") for x in xs], eta=0.1,
                                                                   eps=0.0), [(2,)] * 4)),
    "_shuffle": (RANDOM_PERMUTATION, (nd._shuffle, [(4, 2)])),
    "_scatter_set_nd": (INDEX_WRITE, (lambda x, v: nd._scatter_set_nd(x, v, _index([0, 1], [1, 0]), shape=(2, 3)),
                                      [(2, 3), (2,)])),
    "batch_take": (BATCH_TAKE, (lambda x: nd.batch_take(x, _index(2, 0)), [(2, 4)])),
    "_image_resize": (RESIZE, (lambda x: nd.image.resize(x, size=(2, 2)), [(3, 4, 3)])),
    "all_finite": (OVERFLOW_CHECK, (nd.all_finite, [(2, 3)])),
    "_contrib_allclose": (CLOSENESS_TEST, (nd.contrib.allclose, [(2, 3), (2, 3)])),
    "multi_all_finite": (OVERFLOW_CHECK, (lambda a, b: nd.multi_all_finite(a, b, num_arrays=2), [(2, 3), (3,)])),
}

CREATES = "creates an array from parameters alone: no array inputs to differentiate"
DRAWS = "draws random samples from scalar parameters: no array inputs to differentiate"

# Operators without array inputs: op -> (reason, parameters). Checked: their symbol has no arguments.
NO_ARRAY_INPUTS = {
    "_zeros": (CREATES, dict(shape=(2,))), "_ones": (CREATES, dict(shape=(2,))),
    "_full": (CREATES, dict(shape=(2,), value=1.0)), "_arange": (CREATES, dict(start=0, stop=3)),
    "_eye": (CREATES, dict(N=2)), "_linspace": (CREATES, dict(start=0, stop=1, num=3)),
    "_random_uniform": (DRAWS, dict(shape=(2,))), "_random_normal": (DRAWS, dict(shape=(2,))),
    "_random_randint": (DRAWS, dict(low=0, high=3, shape=(2,))), "_random_exponential": (DRAWS, dict(shape=(2,))),
    "_random_gamma": (DRAWS, dict(shape=(2,))), "_random_poisson": (DRAWS, dict(shape=(2,))),
    "_random_negative_binomial": (DRAWS, dict(shape=(2,))),
}

# ---- checking the claims ------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _module_functions(file):
    """{name: source} of the module-level functions of a test file, decorators included."""
    text = (HERE / file).read_text()
    lines = text.splitlines()
    functions = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            functions[node.name] = "\n".join(lines[first - 1:node.end_lineno])
    return functions


def _test_source(ref):
    """The source of the test ``file::function`` and of the module-level helpers it calls, or None."""
    file, _, name = ref.partition("::")
    if not (HERE / file).is_file():
        return None
    functions = _module_functions(file)
    if name not in functions or not name.startswith("test_"):
        return None
    called = {node.func.id for node in ast.walk(ast.parse(functions[name]))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    return "\n".join([functions[name]] + [functions[f] for f in sorted(called) if f in functions and f != name])


def _spellings(op):
    """How a test can name ``op``: its names and those of the mx.nd sub-namespaces (linalg.gemm)."""
    names = [op, *REGISTRY[op]]
    return names + [attr + "." + n[len(prefix):] for n in names for attr, prefix, _ in SUBNAMESPACES
                    if n.startswith(prefix)]


def _mentions(source, word):
    return re.search(r"(?<!\w)%s(?!\w)" % re.escape(word), source) is not None


def _mapping_problems(mapping, kind, needs_gradient):
    problems = []
    for op, entry in mapping.items():
        ref, wrapper = entry if isinstance(entry, tuple) else (entry, None)
        source = _test_source(ref)
        if op not in REGISTRY:
            problems.append("%s: %s is not a registered operator (aliases: use the operator's name)" % (kind, op))
        elif source is None:
            problems.append("%s: %s -> %s: no such test" % (kind, op, ref))
        elif wrapper is not None:
            wrapped = inspect.getsource(functools.reduce(getattr, wrapper.split("."), mx))
            if not _mentions(wrapped, op):
                problems.append("%s: %s -> mx.%s does not call it" % (kind, op, wrapper))
            if not _mentions(source, wrapper):
                problems.append("%s: %s -> %s does not call mx.%s" % (kind, op, ref, wrapper))
        elif not any(_mentions(source, s) for s in _spellings(op)):
            problems.append("%s: %s -> %s does not mention it" % (kind, op, ref))
        if source is not None and needs_gradient and not re.search(
                r"check_gradient|check_precisions|\.backward\(|autograd\.grad\(", source):
            problems.append("%s: %s -> %s checks no gradient" % (kind, op, ref))
    return problems


def _value_coverage():
    covered, unknown = _table_rows(VALUE_TABLES)
    for op in VALUE_TESTS:
        covered.setdefault(op, []).append("VALUE_TESTS")
    for node in GRADIENT_NODES:
        covered.setdefault(node, []).append("GRADIENT_NODES")
    return covered, unknown


def _gradient_coverage():
    covered, unknown = _table_rows(GRADIENT_TABLES)
    for op in GRADIENT_TESTS:
        covered.setdefault(op, []).append("GRADIENT_TESTS")
    return covered, unknown


GRADIENT_EXEMPTIONS = {**{op: reason for op, (reason, _) in NOT_DIFFERENTIABLE.items()},
                       **{op: reason for op, (reason, _) in NO_ARRAY_INPUTS.items()}, **NO_SECOND_ORDER}


def test_table_rows_name_registered_operators():
    unknown = _value_coverage()[1] + _gradient_coverage()[1]
    assert not unknown, "table rows naming no registered operator:\n  " + "\n  ".join(unknown)
    stale = [key for key in ROWS_NAMING_NO_OPERATOR if key not in gradients.SHAPE_CASES]
    assert not stale, "ROWS_NAMING_NO_OPERATOR lists rows that are gone: %s" % stale


def test_named_tests_exist_and_mention_their_operator():
    problems = _mapping_problems(VALUE_TESTS, "VALUE_TESTS", False)
    problems += _mapping_problems(GRADIENT_TESTS, "GRADIENT_TESTS", True)
    assert not problems, "\n  ".join([""] + problems)


def test_every_operator_has_a_value_test():
    covered = _value_coverage()[0]
    missing = sorted(set(REGISTRY) - set(covered))
    stale = sorted(set(covered) - set(REGISTRY))
    assert not missing and not stale, (
        "operators with no value test (add a row to test_operator_table.py, a VALUE_TESTS entry or a "
        "GRADIENT_NODES entry): %s\nentries naming no registered operator: %s" % (missing, stale))


def test_every_operator_has_a_gradient_check_or_a_reason():
    covered = _gradient_coverage()[0]
    missing = sorted(set(REGISTRY) - set(covered) - set(GRADIENT_EXEMPTIONS))
    stale = sorted((set(covered) | set(GRADIENT_EXEMPTIONS)) - set(REGISTRY))
    both = sorted("%s (%s)" % (op, ", ".join(covered[op])) for op in set(covered) & set(GRADIENT_EXEMPTIONS))
    assert not missing and not stale and not both, (
        "operators with no gradient check and no exemption: %s\nentries naming no registered operator: %s\n"
        "exempt although checked (drop the exemption): %s" % (missing, stale, both))


def _variables(shapes, seed=0):
    rng = np.random.RandomState(seed)
    xs = [nd.array(rng.uniform(-1, 1, size=s), dtype="float64") for s in shapes]
    for x in xs:
        x.attach_grad()
    return xs


def _ops(outputs):
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return gradients.ops_in_graph(outputs)


@pytest.mark.parametrize("node", sorted(GRADIENT_NODES))
def test_gradient_nodes_serve_their_checked_forward_operator(node):
    forward, (fn, shapes) = GRADIENT_NODES[node]
    assert forward in REGISTRY and forward in _gradient_coverage()[0], (
        "%s: its forward operator %s has no gradient check" % (node, forward))
    xs = _variables(shapes)
    with autograd.record():
        out = fn(*xs)
        grads = gradients.gradient_graph_of(fn)(*xs)
    assert forward in _ops(out), "%s: the witness does not call %s" % (node, forward)
    assert node in _ops(grads), "%s is not in the gradient of %s" % (node, forward)


@pytest.mark.parametrize("node", sorted(NO_SECOND_ORDER))
def test_gradient_nodes_without_a_gradient_refuse_second_order(node):
    _, (fn, shapes) = GRADIENT_NODES[node]
    xs = _variables(shapes)
    with autograd.record():
        grads = gradients.gradient_graph_of(fn)(*xs)
        total = sum(g.sum() for g in grads)
    with pytest.raises(mx.MXNetError, match=r"gradient of operator %s \(node" % re.escape(node)):
        total.backward()


@pytest.mark.parametrize("op", sorted(NOT_DIFFERENTIABLE))
def test_operators_without_a_gradient_refuse_backward(op):
    _, (fn, shapes) = NOT_DIFFERENTIABLE[op]
    xs = _variables(shapes)
    with autograd.record():
        outs = fn(*xs)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        total = sum(o.astype("float64").sum() for o in outs)
    for out in outs:
        out.wait_to_read()  # the witness itself is valid: only backward may fail
    assert op in _ops(outs)
    with pytest.raises(mx.MXNetError, match=r"gradient of operator %s \(node" % re.escape(op)):
        total.backward()


@pytest.mark.parametrize("op", sorted(NO_ARRAY_INPUTS))
def test_operators_without_array_inputs_take_none(op):
    _, params = NO_ARRAY_INPUTS[op]
    arguments = getattr(mx.sym, op)(**params).list_arguments()
    assert arguments == [], "%s takes arrays: %s" % (op, arguments)
