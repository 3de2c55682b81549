/* Integer matrix multiply, transpose and trace on small fixed-size matrices. */
#define N 12

static int a[N][N], b[N][N], c[N][N], t[N][N];

static void fill(int m[N][N], int seed) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            m[i][j] = (i * 7 + j * 3 + seed) % 11 - 5;
}

static void multiply(int x[N][N], int y[N][N], int out[N][N]) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            int sum = 0;
            for (int k = 0; k < N; k++)
                sum += x[i][k] * y[k][j];
            out[i][j] = sum;
        }
}

static void transpose(int x[N][N], int out[N][N]) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            out[j][i] = x[i][j];
}

static int trace(int x[N][N]) {
    int s = 0;
    for (int i = 0; i < N; i++)
        s += x[i][i];
    return s;
}

int main(void) {
    fill(a, 1);
    fill(b, 4);
    multiply(a, b, c);
    transpose(c, t);
    return (trace(c) - trace(t)) & 0xFF;
}
