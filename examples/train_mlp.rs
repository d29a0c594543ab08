//! Train a small multi-layer perceptron entirely from Rust: three interleaved spirals in the
//! plane (no linear boundary separates them), a 2-64-64-3 network, softmax cross-entropy and
//! Adam, with autograd recording the forward pass.
//!
//!     cargo run --release --example train_mlp

use std::time::Instant;

use oxnet::prelude::*;

const CLASSES: usize = 3;
const POINTS_PER_CLASS: usize = 200;
const HIDDEN: usize = 64;
const STEPS: usize = 400;
const LEARNING_RATE: f64 = 0.02;

/// Points on three spiral arms with noisy angles (the CS231n toy problem), and their classes.
fn spirals(cpu: Context) -> oxnet::Result<(NDArray, NDArray)> {
    let n = CLASSES * POINTS_PER_CLASS;
    let noise = ops::random_normal(NormalParams::new().scale(0.2).shape(vec![n as i64]).ctx(Some(cpu)))?.to_vec::<f32>()?;
    let mut points = Vec::with_capacity(2 * n);
    let mut labels = Vec::with_capacity(n);
    for class in 0..CLASSES {
        for i in 0..POINTS_PER_CLASS {
            let along = i as f32 / (POINTS_PER_CLASS - 1) as f32;
            let angle = 4.0 * (class as f32 + along) + noise[class * POINTS_PER_CLASS + i];
            points.extend([along * angle.sin(), along * angle.cos()]);
            labels.push(class as f32);
        }
    }
    Ok((NDArray::from_slice(&points, [n, 2], cpu)?, NDArray::from_slice(&labels, [n], cpu)?))
}

/// One layer's weight (He initialization, for ReLU) and bias (zeros), as autograd variables.
fn layer(inputs: usize, outputs: usize, cpu: Context) -> oxnet::Result<(NDArray, NDArray)> {
    let scale = (2.0 / inputs as f64).sqrt();
    let mut weight = ops::random_normal(NormalParams::new().scale(scale).shape(vec![outputs as i64, inputs as i64]).ctx(Some(cpu)))?;
    let mut bias = NDArray::zeros([outputs], DType::F32, cpu)?;
    weight.attach_grad()?;
    bias.attach_grad()?;
    Ok((weight, bias))
}

/// Class scores of the network for `x`.
fn forward(x: &NDArray, parameters: &[NDArray]) -> oxnet::Result<NDArray> {
    let mut h = x.clone();
    for (i, pair) in parameters.chunks(2).enumerate() {
        let (weight, bias) = (&pair[0], &pair[1]);
        h = nn::fully_connected(&h, weight, Some(bias), FullyConnectedParams::new(weight.shape()[0]))?;
        if i + 1 < parameters.len() / 2 {
            h = nn::activation(&h, ActivationParams::new(ActivationType::Relu))?;
        }
    }
    Ok(h)
}

/// Fraction of points whose highest score is their class.
fn accuracy(scores: &NDArray, labels: &NDArray) -> oxnet::Result<f64> {
    let predicted = ops::argmax(scores, ArgReduceParams::new().axis(Some(1)))?;
    Ok(ops::equal(&predicted, labels)?.mean_all()?.to_scalar::<f32>()? as f64)
}

/// Train for `steps` full-batch Adam steps; returns the final training accuracy.
pub fn train(steps: usize, report_every: usize) -> oxnet::Result<f64> {
    let cpu = Context::cpu(0);
    oxnet::random::seed(7);
    let (x, labels) = spirals(cpu)?;
    let batch = x.shape()[0] as f64;
    let mut parameters = Vec::new();
    for (inputs, outputs) in [(2, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES)] {
        let (weight, bias) = layer(inputs, outputs, cpu)?;
        parameters.extend([weight, bias]);
    }
    let moments: Vec<(NDArray, NDArray)> = parameters.iter().map(|p| Ok((ops::zeros_like(p)?, ops::zeros_like(p)?))).collect::<oxnet::Result<_>>()?;
    let adam = AdamParams::new(LEARNING_RATE).rescale_grad(1.0 / batch);
    for step in 1..=steps {
        let loss = {
            let _recording = oxnet::record();
            nn::softmax_cross_entropy(&forward(&x, &parameters)?, &labels)?
        };
        loss.backward()?;
        // Adam's bias correction, folded into the step size as Gluon's Adam does.
        let t = step as i32;
        let lr = LEARNING_RATE * (1.0 - adam.beta2.powi(t)).sqrt() / (1.0 - adam.beta1.powi(t));
        for (parameter, (mean, var)) in parameters.iter().zip(&moments) {
            let grad = parameter.grad().expect("parameters are autograd variables");
            optim::adam_update(parameter, &grad, mean, var, adam.clone().lr(lr))?;
        }
        if report_every > 0 && (step % report_every == 0 || step == 1) {
            println!("step {step:4}  loss {:.4}", loss.to_scalar::<f32>()? as f64 / batch);
        }
    }
    let _inference = oxnet::predict_mode();
    accuracy(&forward(&x, &parameters)?, &labels)
}

fn main() -> oxnet::Result<()> {
    let start = Instant::now();
    let accuracy = train(STEPS, 50)?;
    println!("trained {STEPS} steps in {:.2}s; training accuracy {accuracy:.4}", start.elapsed().as_secs_f64());
    Ok(())
}
