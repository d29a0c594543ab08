//! Every operator's typed parameters, for calling operators from Rust.
//!
//! Each struct is the one its operator parses MXNet's string attributes into (declared once
//! with [`op_params!`](crate::op_params)): `new` takes the required parameters, setters named
//! as the parameters change the others, and [`Params::to_attrs`]
//! writes the attributes the operator reads back. [`crate::ops::call`] invokes any operator with
//! its struct; [`crate::nn`] and [`crate::ops`] wrap the common ones.
//!
//! Two families name a struct `DiagParams`: linear algebra's is `LinalgDiagParams` here.

pub use super::activation::{
    ActivationParams, ActivationType, LeakyReLUParams, LeakyType, SoftmaxActivationMode, SoftmaxActivationParams, SoftmaxBackwardParams,
    SoftmaxParams,
};
pub use super::amp::{AllFiniteParams, AmpCastParams, AmpMultiCastParams, MultiAllFiniteParams};
pub use super::convolution::{ConvolutionBackwardParams, ConvolutionParams};
pub use super::creation::{
    ArangeParams, ExponentialParams, EyeParams, FullParams, GammaParams, InitParams, LinspaceParams, NegativeBinomialParams, NormalParams,
    PoissonParams, RandIntParams, UniformParams,
};
pub use super::ctc::CtcLossParams;
pub use super::deconvolution::{DeconvolutionBackwardParams, DeconvolutionParams};
pub use super::dropout::{DropoutMode, DropoutParams};
pub use super::elemwise_binary::{AddNParams, ScalarParams};
pub use super::gather_scatter::{BackwardPickParams, BooleanMaskParams, DiagParams, PickMode, PickParams, ScatterNdParams, SliceLikeParams};
pub use super::group_norm::{GroupNormBackwardParams, GroupNormParams, InstanceNormParams, L2Mode, L2NormalizationParams, LRNParams};
pub use super::image::{
    AdjustLightingParams, ColorJitterParams, CropParams, NormalizeParams, RandomEnhanceParams, RandomLightingParams, ResizeParams,
};
pub use super::indexing::{EmbeddingParams, OneHotParams, SliceAssignScalarParams, SliceAxisParams, SliceParams, TakeMode, TakeParams};
pub use super::linalg::{DotParams, FullyConnectedBackwardParams, FullyConnectedParams};
pub use super::linalg_la::{CholeskyParams, DiagParams as LinalgDiagParams, Gemm2Params, GemmParams, SyrkParams, TrianParams, TriangularParams};
pub use super::losses::SmoothL1Params;
pub use super::normalization::{BatchNormParams, LayerNormParams};
pub use super::optimizer_updates::{
    AdamParams, AdamWParams, FtmlParams, FtrlParams, LambPhase1Params, LambPhase2Params, MultiAdamParams, MultiAdamWParams, MultiLarsParams,
    MultiSgdParams, MultiSumSqParams, PreloadedMultiSgdParams, RmspropParams, SgdMomParams, SgdParams, SignumParams,
};
pub use super::output_layers::{GradNormalization, MakeLossParams, RegressionBackwardParams, RegressionOutputParams, SoftmaxOutputParams};
pub use super::pad::{PadMode, PadParams};
pub use super::params::{NoParams, Params};
pub use super::pooling::{PoolingConvention, PoolingParams, PoolingType};
pub use super::rearrange::{
    BlockSizeParams, BroadcastAxisParams, BroadcastLikeParams, BroadcastToParams, FlipParams, RepeatParams, SqueezeParams, StackParams,
    SwapAxesParams, TileParams,
};
pub use super::reduce::{AllCloseParams, ArgReduceParams, MomentsParams, NormParams, ReduceParams, SpreadParams};
pub use super::rnn::{RnnMode, RnnParams};
pub use super::sampling::{MultinomialParams, SampleParams};
pub use super::select::ClipParams;
pub use super::sequence::SequenceParams;
pub use super::shape_ops::{CastParams, ConcatParams, ExpandDimsParams, ReshapeParams, SliceChannelParams, TransposeParams};
pub use super::sorting::{ArgsortParams, OrderBackwardParams, SortParams, TopkParams, TopkReturn};
pub use super::upsampling::{MultiInputMode, SampleType, UpSamplingParams};
