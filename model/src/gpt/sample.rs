//! Text from a GPT: each next token drawn from the softmax of the last position's logits
//! over `temperature`, among the `top_k` most likely (nanoGPT's `generate`).

use super::Gpt;
use crate::error::ModelError;
use crate::rng::SplitMix64;

/// How to draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Tokens to add.
    pub tokens: usize,
    /// Divides the logits: below 1 sharper, above 1 flatter; 0 takes the most likely.
    pub temperature: f32,
    /// Only the `top_k` most likely tokens are drawn from (0: all).
    pub top_k: usize,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            tokens: 200,
            temperature: 0.8,
            top_k: 20,
            seed: 0,
        }
    }
}

impl Gpt {
    /// `prompt` continued by `how.tokens` tokens (the prompt not included). An empty prompt
    /// starts from token 0.
    pub fn generate(
        &self,
        params: &[f32],
        prompt: &[usize],
        how: Sampling,
    ) -> Result<Vec<usize>, ModelError> {
        let mut ids = if prompt.is_empty() {
            vec![0]
        } else {
            prompt.to_vec()
        };
        let start = ids.len();
        let mut rng = SplitMix64::new(how.seed);
        for _ in 0..how.tokens {
            let logits = self.next_logits(params, &ids)?;
            ids.push(pick(&logits, how, &mut rng));
        }
        Ok(ids.split_off(start))
    }
}

/// One draw from `logits` as `how` says.
fn pick(logits: &[f32], how: Sampling, rng: &mut SplitMix64) -> usize {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if how.temperature <= 0.0 || !how.temperature.is_finite() {
        return order[0];
    }
    if how.top_k > 0 {
        order.truncate(how.top_k);
    }
    let max = logits[order[0]];
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| libm::exp(f64::from((logits[i] - max) / how.temperature)))
        .collect();
    let mut r = rng.next_f64() * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if r < *w {
            return i;
        }
        r -= w;
    }
    order[order.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_zero_takes_the_most_likely_and_top_k_bounds_the_draws() {
        let logits = [0.1, 3.0, 2.9, -1.0];
        let mut rng = SplitMix64::new(1);
        let greedy = Sampling {
            temperature: 0.0,
            ..Sampling::default()
        };
        assert_eq!(pick(&logits, greedy, &mut rng), 1);
        let two = Sampling {
            top_k: 2,
            temperature: 1.0,
            ..Sampling::default()
        };
        let mut seen = [0; 4];
        for _ in 0..2000 {
            seen[pick(&logits, two, &mut rng)] += 1;
        }
        assert_eq!((seen[0], seen[3]), (0, 0), "outside the top 2: {seen:?}");
        // e^0.1 : 1, so about 52.5 % and 47.5 %.
        assert!(
            (900..1200).contains(&seen[1]) && (800..1100).contains(&seen[2]),
            "{seen:?}"
        );
    }
}
