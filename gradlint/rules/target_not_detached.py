"""GL017: a TD target, advantage or teacher output that enters the loss still carrying a gradient."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.training.targets import Position, UndetachedTarget
from gradlint.rule import Rule

MESSAGES = {
    Position.BOOTSTRAP: (
        "the bootstrapped target `{value}` carries a gradient from `{source}`, "
        "so backward also flows into the target instead of holding it constant"
    ),
    Position.WEIGHT: (
        "`{value}` multiplies a log-probability but carries a gradient from `{source}`, "
        "so backward also flows into it instead of holding it constant"
    ),
    Position.TEACHER: (
        "the target `{value}` carries a gradient from `{source}`, "
        "so backward also flows into the teacher or target network"
    ),
}


class TargetNotDetached(Rule):
    """Checks for targets, advantages and teacher outputs that enter a backpropagated loss with a gradient.

    Why is this bad?
    Autograd differentiates a loss with respect to everything in it that has a
    `grad_fn`. Semi-gradient methods need some values to be constants. A TD or bootstrap
    target (`r + gamma * q_target(s2).max(1)[0]`) computed with grad lets backward
    push the target toward the prediction as well, so Q-learning and actor-critic
    critics chase a moving target; when the target comes from the online network
    itself, training is no longer Q-learning at all. An advantage `returns - values`
    (or any baseline) that is not detached in the actor term `-(log_prob * advantage)`
    trains the critic through the policy gradient, and a probability or importance
    weight of a correction term (ACER's `pi * log(pi) * (q - v)`) turns the estimator
    into a different, biased one. A teacher's or target network's output used as a
    target with its graph sends gradients into that network: it drifts if it is
    trained, and each step backpropagates through it for nothing if it is not.
    Nothing raises; the model learns worse or diverges.

    A value is reported where it sits in the loss: the bootstrapped sum, the factor next
    to the log-probability or probability ratio, or the target argument of a criterion
    whose network is named as a teacher, EMA or target network; the network call it
    carries the gradient from is the related location. Values detached anywhere on the
    way (`.detach()`, `.item()`, `.numpy()`, `torch.tensor(...)`), computed under
    `torch.no_grad()` (SAC and TD3 targets) or by a network whose parameters are frozen
    (`requires_grad_(False)`), critic terms where the value is meant to train
    (`(returns - values).pow(2)`), an advantage detached in the actor term but not in
    the critic term, entropies (`-(probs * log_probs).sum()`) and GAE from numpy
    values are fine and not reported, and so is the NumPy of a library that scores an
    estimator beside its torch models: `np.log(p)` (a function of NumPy, SciPy or another
    array library, resolved through the imports) is an array, not a log-probability.
    Neither is the loss itself: a sum reached from
    the backpropagated loss through its terms, their differences, weights and reductions
    is what is trained, not a target (a FactorVAE's `recon + kld + gamma * tc`): a
    bootstrapped sum is a target only where a prediction is regressed onto it (squared,
    or in a criterion), and one the loss holds linearly is the objective, differentiated
    through on purpose (a DICE dual's `(w * (c + gamma * nu(s2) - nu(s))).mean()`). A rollout's
    per-step log-probabilities and values kept in lists are followed through
    `torch.stack`, `torch.cat` and `zip`.

    A helper of the module that receives the values (`update(optimizer, log_probs, values,
    rewards)` after a rollout appended the critic's outputs to `values`) is judged with
    what its callers in the module pass it.

    Known problems
    Only the shapes above are recognised, by the names and operations the code uses
    (`gamma`, `discount`, `log_prob`, `ratio`, `teacher`, `target`); a target built in
    a function of another module is not followed. A network frozen in another module
    counts as trained.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html
    http://incompleteideas.net/book/RLbook2020.pdf (section 9.3, semi-gradient methods)
    """

    code = "GL017"
    name = "target-not-detached"
    message = "this value must be a constant of the loss but carries a gradient from a network call"
    requires = ((b"backward", b"training_step", b"loss"),)
    example = """
        for states, actions, rewards, next_states, dones in replay:
            q = q_net(states).gather(1, actions)
            target = rewards + gamma * target_net(next_states).max(1, keepdim=True)[0] * (1 - dones)
            loss = F.smooth_l1_loss(q, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        for states, actions, rewards, next_states, dones in replay:
            q = q_net(states).gather(1, actions)
            with torch.no_grad():
                target = rewards + gamma * target_net(next_states).max(1, keepdim=True)[0] * (1 - dones)
            loss = F.smooth_l1_loss(q, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        for found in self.analysis.targets.undetached():
            self.report(found.node, self._message(found), related=self._related(found))

    def _message(self, found: UndetachedTarget) -> str:
        code = self.analysis.code
        return MESSAGES[found.position].format(value=code(found.node), source=code(found.sources[0]))

    def _related(self, found: UndetachedTarget) -> list[tuple[cst.CSTNode, str]]:
        return [(source, "the network call the gradient comes from") for source in found.sources]
