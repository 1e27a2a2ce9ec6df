// candor's confidence, and an abstention's refusal, as providerMetadata.candor (@ai-sdk/openai-compatible).
export const candorMetadata = {
  async extractMetadata({ parsedBody }) {
    const choice = parsedBody?.choices?.[0];
    return { candor: { confidence: choice?.confidence ?? null, refusal: choice?.message?.refusal ?? null } };
  },
  createStreamExtractor() {
    const seen = { confidence: null, refusal: null };
    return {
      processChunk(chunk) {
        const choice = chunk?.choices?.[0];
        if (choice?.confidence) seen.confidence = choice.confidence;
        if (choice?.delta?.refusal) seen.refusal = (seen.refusal ?? "") + choice.delta.refusal;
      },
      buildMetadata: () => ({ candor: seen }),
    };
  },
};
