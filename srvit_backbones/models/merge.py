"""Token merging inside a recursive unit (MergeOver): ToMe's bipartite soft matching (Bolya et al., ICLR 2023) at the
unit's entry, unmerged at its exit (docs/models.md). Patch tokens split alternately into sets A and B; the ``r`` A
tokens most similar (cosine) to a B token are averaged into it. Prefix tokens are neither merged nor merged into."""
import torch

from .rules import check_merge_ratio


class BipartiteMerge:
    """One merge of (B, N, C) token sets and its inverse.

    Args:
        metric: (B, N, C) features whose cosine similarity decides the matching.
        ratio: fraction of the patch tokens to remove, in [0, 0.5] (else a ValueError).
        num_prefix_tokens: leading tokens that are kept as they are.
    """

    def __init__(self, metric: torch.Tensor, ratio: float, num_prefix_tokens: int = 0):
        ratio = check_merge_ratio(ratio)
        batch, num_tokens, _ = metric.shape
        self.num_tokens = num_tokens
        self.prefix = num_prefix_tokens
        num_patches = num_tokens - num_prefix_tokens
        self.num_a = (num_patches + 1) // 2
        self.r = min(int(ratio * num_patches), self.num_a)
        with torch.no_grad():
            metric = metric[:, num_prefix_tokens:]
            metric = metric.to(torch.promote_types(metric.dtype, torch.float32))
            metric = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-6)
            scores = metric[:, 0::2] @ metric[:, 1::2].transpose(1, 2)  # (B, |A|, |B|)
            best, best_b = scores.max(dim=-1)
            order = best.argsort(dim=-1, descending=True)
        self.merged_a = order[:, :self.r]  # A tokens that merge away (indices into A)
        self.kept_a = order[:, self.r:]  # A tokens that stay
        self.partner_b = best_b.gather(1, self.merged_a)  # the B token each merges into
        ones = torch.ones(batch, num_tokens, 1, device=metric.device, dtype=torch.float32)
        self.size = self._sum(ones)  # tokens each reduced token stands for

    def _split(self, x: torch.Tensor):
        patches = x[:, self.prefix:]
        return x[:, :self.prefix], patches[:, 0::2], patches[:, 1::2]

    @staticmethod
    def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N - r, C): the prefix tokens, the kept A tokens, then the B tokens averaged with those
        merged into them."""
        return self._sum(x) / self.size.to(x.dtype)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        prefix, a, b = self._split(x)
        kept = self._take(a, self.kept_a)
        moving = self._take(a, self.merged_a)
        index = self.partner_b.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        b = b.scatter_add(1, index, moving)
        return torch.cat([prefix, kept, b], dim=1)

    def attention_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, 1, N - r) additive attention bias log(size): proportional attention."""
        return self.size.log().to(dtype).transpose(1, 2).unsqueeze(1)

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """(B, N - r, C) -> (B, N, C): every token takes the value of the token it became."""
        prefix, kept, b = y[:, :self.prefix], y[:, self.prefix:self.prefix + self.num_a - self.r], \
            y[:, self.prefix + self.num_a - self.r:]
        a = y.new_empty(y.shape[0], self.num_a, y.shape[-1])
        a.scatter_(1, self.kept_a.unsqueeze(-1).expand_as(kept), kept)
        a.scatter_(1, self.merged_a.unsqueeze(-1).expand(-1, -1, y.shape[-1]), self._take(b, self.partner_b))
        patches = y.new_empty(y.shape[0], self.num_tokens - self.prefix, y.shape[-1])
        patches[:, 0::2] = a
        patches[:, 1::2] = b
        return torch.cat([prefix, patches], dim=1)
