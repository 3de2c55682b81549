/* Floating-point kernels: a 5-tap FIR filter, saxpy and a dot product. */
#define LEN 128

static float signal[LEN], filtered[LEN], y[LEN];
static const float taps[5] = {0.1f, 0.2f, 0.4f, 0.2f, 0.1f};

static void fir(const float *in, float *out, int n) {
    for (int i = 0; i < n; i++) {
        float acc = 0.0f;
        for (int k = 0; k < 5; k++) {
            int j = i - k;
            if (j >= 0)
                acc += taps[k] * in[j];
        }
        out[i] = acc;
    }
}

static void saxpy(float a, const float *x, float *out, int n) {
    for (int i = 0; i < n; i++)
        out[i] = a * x[i] + out[i];
}

static float dot(const float *x, const float *z, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += x[i] * z[i];
    return s;
}

int main(void) {
    for (int i = 0; i < LEN; i++) {
        signal[i] = (float)((i % 16) - 8);
        y[i] = 1.0f;
    }
    fir(signal, filtered, LEN);
    saxpy(0.5f, filtered, y, LEN);
    return (int)dot(y, signal, LEN) & 0xFF;
}
