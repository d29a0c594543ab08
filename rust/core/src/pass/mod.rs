//! Graph passes: each takes a graph (its output entries) and returns a new graph or facts about it.

pub mod cse;
pub mod fuse;
pub mod gradient;
pub mod infer;
pub mod mirror;
pub mod plan_memory;
