"""AMP's operator lists for target dtype bfloat16: every operator oxnet registers (aliases included,
gradient operators excepted) in exactly one list, classified as MXNet 1.9.1 classifies it."""

# Worth running in bfloat16: amp.init casts their float inputs to bfloat16.
BF16_FUNCS = [
    'Convolution', 'FullyConnected',
]

# Indifferent to the precision: they run in whatever float type they get (or are not part of a
# network's computation: optimizers, creation, image preprocessing).
BF16_FP32_FUNCS = [
    'BatchNorm', 'Concat', 'LRN', 'Pooling', '_add', '_broadcast_reduced_like', '_cast_like', '_shuffle', 'abs',
    'amp_cast', 'amp_multicast', 'clip', 'concat', 'isfinite', 'isinf', 'isnan', 'relu', 'shuffle', 'sqrt',
    'square',
    'tanh',
]

# Need float32 (reductions, exponentials, losses, normalizations): their float inputs are cast
# to float32.
FP32_FUNCS = [
    'BlockGrad', 'CTCLoss', 'Cast', 'Custom', 'Deconvolution', 'Dropout', 'Embedding', 'Flatten', 'GroupNorm',
    'InstanceNorm', 'L2Normalization', 'LayerNorm', 'LinearRegressionOutput', 'LogisticRegressionOutput',
    'MAERegressionOutput', 'MakeLoss', 'Pad', 'RNN', 'Reshape', 'SequenceLast', 'SequenceMask', 'SequenceReverse',
    'SliceChannel', 'Softmax', 'SoftmaxActivation', 'SoftmaxOutput', 'SwapAxis', 'UpSampling', '_DivScalar',
    '_EqualScalar', '_GreaterEqualScalar', '_GreaterScalar', '_Hypot', '_HypotScalar', '_LesserEqualScalar',
    '_LesserScalar', '_LogicalAndScalar', '_LogicalOrScalar', '_LogicalXorScalar', '_MaximumScalar',
    '_MinimumScalar', '_MinusScalar', '_ModScalar', '_MulScalar', '_NotEqualScalar', '_PlusScalar', '_Power',
    '_PowerScalar', '_RDivScalar', '_RMinusScalar', '_RModScalar', '_RPowerScalar', '_arange', '_contrib_CTCLoss',
    '_contrib_adamw_update', '_contrib_boolean_mask', '_contrib_ctc_loss', '_contrib_mp_adamw_update',
    '_multi_adamw_update', '_multi_mp_adamw_update', '_copy',
    '_crop_assign', '_crop_assign_scalar', '_digamma', '_div_scalar', '_equal_scalar', '_eye', '_full', '_grad_add',
    '_greater_equal_scalar', '_greater_scalar', '_hypot', '_hypot_scalar', '_identity_with_attr_like_rhs',
    '_image_adjust_lighting', '_image_crop', '_image_flip_left_right', '_image_flip_top_bottom', '_image_normalize',
    '_image_random_brightness', '_image_random_color_jitter', '_image_random_contrast',
    '_image_random_flip_left_right', '_image_random_flip_top_bottom', '_image_random_hue', '_image_random_lighting',
    '_image_random_saturation', '_image_resize', '_image_to_tensor', '_lesser_equal_scalar', '_lesser_scalar',
    '_linalg_det', '_linalg_extractdiag', '_linalg_extracttrian', '_linalg_gelqf', '_linalg_gemm', '_linalg_gemm2',
    '_linalg_inverse', '_linalg_makediag', '_linalg_maketrian', '_linalg_potrf', '_linalg_potri', '_linalg_slogdet',
    '_linalg_sumlogdiag', '_linalg_syevd', '_linalg_syrk', '_linalg_trmm', '_linalg_trsm', '_linspace',
    '_logical_and_scalar', '_logical_or_scalar', '_logical_xor_scalar', '_maximum_scalar', '_minimum_scalar',
    '_minus_scalar', '_mod_scalar', '_mul_scalar', '_not_equal_scalar', '_ones', '_plus_scalar', '_power',
    '_power_scalar', '_random_exponential', '_random_gamma', '_random_negative_binomial', '_random_normal',
    '_random_poisson', '_random_randint', '_random_uniform', '_rdiv_scalar', '_reduce_sum_to_like',
    '_rminus_scalar',
    '_rmod_scalar', '_rnn_param_concat', '_rpower_scalar', '_sample_exponential', '_sample_gamma',
    '_sample_generalized_negative_binomial', '_sample_multinomial', '_sample_negative_binomial', '_sample_normal',
    '_sample_poisson', '_sample_uniform', '_scatter_set_nd', '_slice', '_slice_assign', '_slice_assign_scalar',
    '_softrelu', '_zeros', 'adam_update', 'all_finite', 'arccos', 'arccosh', 'arcsin', 'arcsinh', 'arctan',
    'arctanh', 'argmax', 'argmax_channel', 'argmin', 'argsort', 'batch_take', 'boolean_mask', 'broadcast_axes',
    'broadcast_axis', 'broadcast_hypot', 'broadcast_like', 'broadcast_mul', 'broadcast_power', 'broadcast_to',
    'cast', 'cbrt', 'ceil', 'choose_element_0index', 'cos', 'cosh', 'crop', 'ctc_loss', 'degrees', 'depth_to_space',
    'diag', 'erf', 'erfinv', 'exp', 'expand_dims', 'expm1', 'fix', 'flatten', 'flip', 'floor', 'ftml_update',
    'ftrl_update', 'gamma', 'gammaln', 'gather_nd', 'identity', 'lamb_update_phase1', 'lamb_update_phase2',
    'linalg_det', 'linalg_extractdiag', 'linalg_extracttrian', 'linalg_gelqf', 'linalg_gemm', 'linalg_gemm2',
    'linalg_inverse', 'linalg_makediag', 'linalg_maketrian', 'linalg_potrf', 'linalg_potri', 'linalg_slogdet',
    'linalg_sumlogdiag', 'linalg_syrk', 'linalg_trmm', 'linalg_trsm', 'log', 'log10', 'log1p', 'log2',
    'log_softmax',
    'logical_not', 'make_loss', 'max', 'max_axis', 'mean', 'min', 'min_axis', 'moments', 'mp_lamb_update_phase1',
    'mp_lamb_update_phase2', 'mp_nag_mom_update', 'mp_sgd_mom_update', 'mp_sgd_update', 'multi_adam_update',
    'multi_all_finite',
    'multi_lars', 'multi_mp_adam_update', 'multi_mp_sgd_mom_update', 'multi_mp_sgd_update', 'multi_sgd_mom_update',
    'multi_sgd_update',
    'multi_sum_sq', 'nag_mom_update', 'nanprod', 'nansum', 'negative', 'norm', 'normal', 'one_hot', 'ones_like',
    'pad', 'pick', 'preloaded_multi_mp_sgd_mom_update', 'preloaded_multi_mp_sgd_update',
    'preloaded_multi_sgd_mom_update', 'preloaded_multi_sgd_update', 'prod', 'radians', 'random_exponential',
    'random_gamma', 'random_negative_binomial', 'random_normal', 'random_poisson', 'random_randint',
    'random_uniform', 'rcbrt', 'reciprocal', 'repeat', 'reshape', 'reshape_like', 'reverse', 'rint',
    'rmsprop_update', 'rmspropalex_update', 'round', 'rsqrt', 'sample_exponential', 'sample_gamma',
    'sample_generalized_negative_binomial', 'sample_multinomial', 'sample_negative_binomial', 'sample_normal',
    'sample_poisson', 'sample_uniform', 'scatter_nd', 'sgd_mom_update', 'sgd_update', 'shape_array', 'sigmoid',
    'sign', 'signsgd_update', 'signum_update', 'sin', 'sinh', 'size_array', 'slice', 'slice_axis', 'slice_like',
    'smooth_l1', 'softmax', 'softmax_cross_entropy', 'softmin', 'softsign', 'sort', 'space_to_depth', 'split',
    'squeeze', 'stop_gradient', 'sum', 'sum_axis', 'swapaxes', 'take', 'tan', 'tile', 'topk', 'transpose', 'trunc',
    'uniform', 'zeros_like',
]

# Need float32 only for some parameter values: (operator, parameter, values).
CONDITIONAL_FP32_FUNCS = [
    ('Activation', 'act_type', ['softrelu']),
    ('LeakyReLU', 'act_type', ['elu', 'selu']),
]

# Take several inputs of one type: their inputs are cast to the widest float type among them.
WIDEST_TYPE_CASTS = [
    'ElementWiseSum', '_Div', '_contrib_allclose', '_Equal', '_Greater', '_Greater_Equal', '_Lesser', '_Lesser_Equal', '_Logical_And',
    '_Logical_Or', '_Logical_Xor', '_Maximum', '_Minimum', '_Minus', '_Mod', '_Mul', '_Not_Equal', '_Plus', '_div',
    '_equal', '_greater', '_greater_equal', '_lesser', '_lesser_equal', '_logical_and', '_logical_or',
    '_logical_xor', '_maximum', '_minimum', '_minus', '_mod', '_mul', '_not_equal', '_plus',
    '_sparse_ElementWiseSum', '_sub', 'add_n', 'batch_dot', 'broadcast_add', 'broadcast_div', 'broadcast_equal',
    'broadcast_greater', 'broadcast_greater_equal', 'broadcast_lesser', 'broadcast_lesser_equal',
    'broadcast_logical_and', 'broadcast_logical_or', 'broadcast_logical_xor', 'broadcast_maximum',
    'broadcast_minimum', 'broadcast_minus', 'broadcast_mod', 'broadcast_not_equal', 'broadcast_plus',
    'broadcast_sub', 'dot', 'elemwise_add', 'elemwise_div', 'elemwise_mul', 'elemwise_sub', 'stack', 'where',
]

# Output layers whose gradient AMP scales by the loss scale (grad_scale) in imperative use.
LOSS_OUTPUT_FUNCTIONS = [
    'LinearRegressionOutput', 'LogisticRegressionOutput', 'MAERegressionOutput', 'SoftmaxOutput',
]

# Inputs that stay float32 when the operator runs in bfloat16, by input position ('' marks an
# input that is cast).
BF16_USE_FP32_PARAMS = {
    'BatchNorm': ['', 'gamma', 'beta', 'moving_mean', 'moving_var'],
}
